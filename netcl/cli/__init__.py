"""The `netcl` command line: one module per subcommand, wired together in main.py."""
