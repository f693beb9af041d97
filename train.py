"""Coherence tuning (paper appendix "From coherence boosting to coherence tuning"): ``cblight tune`` under the
script's name, with LightningCLI's ``fit``.

python train.py fit -c configs/coherence_tuning.yaml [-c configs/logger/wandb.yaml] [--trainer.devices 4]
"""

from cblight.cli import tune_cli

if __name__ == "__main__":
    tune_cli()
