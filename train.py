"""Coherence tuning (paper appendix "From coherence boosting to coherence tuning").

python train.py fit -c configs/coherence_tuning.yaml [-c configs/logger/wandb.yaml] [--trainer.devices 4]
"""

from cblight.cli import exit_on_bad_input, train_cli

if __name__ == "__main__":
    exit_on_bad_input(train_cli)
