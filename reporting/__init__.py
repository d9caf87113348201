"""The ground floor, which anything may import and which imports nothing of the project: what a
command shows on the console and keeps in its log file (`console`, with C++ log lines routed
by `native_log`), progress lines (`progress`), and `UsageError`, the error a command reports
in one line (`errors`)."""
