"""Sub-commands of the ``colibri`` CLI; see ``colibri.cli``."""
