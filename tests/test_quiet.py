"""Third-party chatter goes to the stage's log (pipeline/core/quiet.py), including a library's logging handler bound
to the sys.stdout of an earlier stage (ModelOpt binds one when it is imported, under the first stage's capture)."""

import logging

from pipeline.core.quiet import captured


def test_a_handler_bound_in_an_earlier_capture_writes_to_the_current_log_and_to_nothing_outside(tmp_path, capfd):
    import sys

    logger = logging.getLogger("test_quiet.library")
    logger.setLevel(logging.INFO)
    logger.propagate = False
    try:
        with captured(tmp_path / "first.log"):
            logger.addHandler(logging.StreamHandler(sys.stdout))  # as ModelOpt's import does
            logger.info("during the first stage")
        logger.info("between stages")
        with captured(tmp_path / "second.log"):
            logger.info("during the second stage")
        assert (tmp_path / "first.log").read_text() == "during the first stage\n"
        assert (tmp_path / "second.log").read_text() == "during the second stage\n"  # no "--- Logging error ---" traceback
        assert "Logging error" not in capfd.readouterr().err  # nor on the terminal between them
    finally:
        logger.handlers.clear()
