"""``python -m basecap.hf ARGS``: lm-evaluation-harness's command line (``lm_eval ARGS``) with the
``basecap`` model type registered, so ``--model hf --model_args pretrained=EXPORT_DIR`` loads an
exported run without ``trust_remote_code``."""

import basecap.hf  # noqa: F401  (registers model_type "basecap" with the Auto classes)

if __name__ == "__main__":
    from lm_eval.__main__ import cli_evaluate

    cli_evaluate()
