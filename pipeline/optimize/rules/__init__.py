"""All rewrite rules, in the order they are tried within their priority."""

from pipeline.optimize.rules import attention_scale, cast, constant_folding, gelu, layernorm, lookup, noop, sequence

ALL_RULES = [*constant_folding.RULES, *noop.RULES, *cast.RULES, *sequence.RULES, *lookup.RULES, *layernorm.RULES, *gelu.RULES, *attention_scale.RULES]
RULE_NAMES = [rule.name for rule in ALL_RULES]
