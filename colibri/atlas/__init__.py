"""The expert atlas: which routed experts specialise in which topic (colibri's
`tools/expert_atlas`, seed README): ``sweep`` runs topic-tagged probes through an engine and
keeps one STATS dump per run, ``analyze`` turns the dumps into base-rate-corrected topic
distributions with a replication gate, ``validate`` checks them by leave-one-prompt-out
against a label-permutation null."""
