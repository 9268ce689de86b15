"""What a training step costs: memory per GPU, communication per group, bubble, FLOPs.

:mod:`snippets.cost.formulas` is the reference (Megatron's own formulas, called, plus a few small
ones of ours); note 26 and the calculator page (``docs/explorers/calculator.md``) both use it.
"""
