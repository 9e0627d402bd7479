"""Deciding before running: what fits where, and whether (and how) to speculate.

  memory        the bytes each device of a mesh holds (params, caches, activations)
  mesh          the (data, model) mesh a run uses: the fewest model devices that fit
  draft_memory  closed-form memory of a classic draft and of an EAGLE-3 head
  picker        which drafter family and γ / tree size, or none, from measurements
  picker_io     the picker's inputs read from a results JSON
"""
