"""The command-line layer: one module per command (its flags, help groups and `main`), the
console and log file (`console`), progress lines (`progress`), grouped `--help`
(`flag_groups`). Nothing here imports TensorFlow at module level."""
