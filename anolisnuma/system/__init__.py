"""System adapters: the only code that reads or writes host files."""
