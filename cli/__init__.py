"""The commands, the top floor: one module per command (its flags, `--help` groups and
`main`), every flag definition (`flag_groups`, `flag_ranges`, `nvidia_flags`,
`pretraining_flags`, `finetuning_flags`), the parsed flags turned into a job's options
(`flag_options`), and the end-to-end demo (`demo`). Nothing here imports TensorFlow at module
level: a command prepares the process first (`command.prepare_process`)."""
