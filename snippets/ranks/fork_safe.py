"""Imported first by every process that forks ranks (``launch._PRELOAD``): from here on, asking
whether CUDA is available does not mark this process as one that may have initialized CUDA.

torch's CUDA build answers ``torch.cuda.is_available()`` through ``cudaGetDeviceCount`` and, on
every call, records that the process may hold a CUDA context; a process forked from it then refuses
every CUDA call with "Cannot re-initialize CUDA in forked subprocess". Importing megatron.core asks
twice (``dist_checkpointing/strategies/torch.py`` at import, and torch's ``cpp_extension`` that
``tensor_parallel/random.py`` imports, when a CUDA toolkit is installed). On a machine without a
CUDA driver the answer is False either way; :func:`snippets.cpu.devices.probe_cuda_without_poisoning_fork`
gives it without the record. With a driver the real check runs, as before.
"""

from snippets.cpu import devices

devices.probe_cuda_without_poisoning_fork()
