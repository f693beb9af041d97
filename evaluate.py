"""Coherence-boosted evaluation (paper Tables 1, 4, 5): ``cblight evaluate`` under the script's name.

python evaluate.py -c configs/lambada.yaml
python evaluate.py -c configs/multiple_choice.yaml --model.model gpt2 --data.tasks [copa]
"""

from cblight.cli import evaluate_cli

if __name__ == "__main__":
    evaluate_cli()
