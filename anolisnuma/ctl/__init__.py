"""``anolisnuma-ctl``: the operator's command line (subcommands live in this package)."""
