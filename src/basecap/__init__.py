"""basecap: how sequence-modeling architecture shapes the base capabilities of language models.

Python API (everything the CLI does):

    from basecap.data import build_corpus, load_recipe        # corpus
    from basecap.config import load_experiment                 # typed experiment configs
    from basecap.train import train                            # one run
    from basecap.eval.final import evaluate_run                # test-split loss / bits per byte
    from basecap.report import report                          # report.md / report.html
    from basecap.experiment import run_experiment              # all of the above
"""

__version__ = "0.1.0"
