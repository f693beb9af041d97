"""cblight: coherence boosting and coherence tuning of causal language models on PyTorch Lightning.

Malkin, Wang & Jojic, "Coherence boosting: When your pretrained language model is not paying enough
attention" (ACL 2022).
"""

__version__ = "0.1.0"
