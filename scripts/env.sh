# Sourced by every script in scripts/: the known-harmless messages, filtered in one place.
# - megatron.core warns at import that Transformer Engine and Apex are absent (a CPU machine never
#   has them; the fallbacks are what the notes use). PYTHONWARNINGS reaches every Python process the
#   scripts start (mkdocs, JupyterLab's kernels, nbval's kernels, pytest, ranks, and the processes
#   dist_checkpointing spawns, which import megatron.core (0.19.0's MimoModelConfig warns) before snippets).
# - mkdocs-material prints a multi-line "end of life" banner on every build.
# - pip prints one "Location ... is ignored: it is neither a file nor a directory" per configured
#   package location that does not exist on this machine (quiet_pip drops them).
export PYTHONWARNINGS="ignore:Transformer Engine and Apex are not installed:UserWarning,ignore:Apex is not installed:UserWarning,ignore:MimoModelConfig is experimental:UserWarning${PYTHONWARNINGS:+,$PYTHONWARNINGS}"
export NO_MKDOCS_2_WARNING=1

quiet_pip() {
  grep --line-buffered -v -e "is ignored: it is neither a file nor a directory" || true
}
