"""Offline BERT pre-training (masked LM + next-sentence prediction) into servable checkpoints."""
