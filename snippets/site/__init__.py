"""Site tooling: pinned source links, the drift report against a newer tag, the new-note scaffold."""
