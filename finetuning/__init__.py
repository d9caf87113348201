"""finetuning package."""
