"""Machinery behind the notes: launching CPU ranks, the CPU compat layer, recording
collectives, rendering tables, pinned source links. Notes import from here; nothing here
imports a note."""
