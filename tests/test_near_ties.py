"""The export check draws other inputs where a mixture of experts' routing ties (pipeline/near_ties.py): a token
whose k-th and (k+1)-th router scores differ by less than float rounding goes to either expert, on torch or on
onnxruntime, and that cannot tell a faithful export from a wrong one."""

import pytest
import torch

from pipeline.export import export_model
from pipeline.near_ties import TIE_MARGIN, topk_margins


def test_the_margin_of_a_topk_is_the_gap_after_its_kth_value_relative_above_one():
    scores = torch.tensor([[3.0, 1.0, 1.0 + 2**-20, 0.0], [0.5, 0.25, 0.0, 0.125]])
    with topk_margins() as margins:
        torch.topk(scores, 1)
        scores.topk(2, dim=-1)
        torch.topk(scores.to(torch.int64), 1)  # integers do not round: no margin
        torch.topk(scores, torch.tensor(1), dim=0, out=(torch.empty(0), torch.empty(0, dtype=torch.int64)))  # as a model may call it
    assert margins[0] == 0.25  # row 1's 0.5 - 0.25 (under 1: absolute); row 0's 3 - 1 is 2/3 of 3
    assert margins[1] == pytest.approx(2**-20 / (1.0 + 2**-20))  # row 0's 2nd and 3rd; row 1's gap is 0.125
    assert margins[2] == float("inf")
    assert margins[3] == 0.125  # along dim 0, k a tensor, out= given: column 3's 0.125 - 0 is the closest


def test_a_mixture_of_experts_whose_routing_ties_on_the_check_inputs_is_checked_on_other_ones(tmp_path):
    """GraniteMoE-Hybrid's small config: at the check's second size, token 110's two best layer-0 router scores
    differ by 4e-8, onnxruntime routes it to the other expert, and the export was refused (0.08 over 3.73, four
    tokens) though every other token agreed to 2e-6."""
    pytest.importorskip("transformers")
    from pipeline.core.profiles import load_profile
    from pipeline.core.samples import check_sizes, make_inputs
    from pipeline.models.module import build_module, run_module
    from pipeline.models.starter import starter_profile

    path = tmp_path / "granite.toml"
    path.write_text(starter_profile("granitemoehybrid", None, "granite", tmp_path))
    profile = load_profile(str(path))
    module, _, _, export_profile = build_module(profile)
    feeds = make_inputs(export_profile, seed=1001, dims=check_sizes(export_profile)[1])
    with topk_margins() as margins:
        run_module(module, tuple(torch.from_numpy(a) for a in feeds.values()), export_profile)
    assert min(margins) < TIE_MARGIN  # the inputs the check drew first
    assert export_model(profile, tmp_path / "m.onnx").max_abs_diff < 1e-4
