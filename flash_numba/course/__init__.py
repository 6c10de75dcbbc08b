"""The course: what the lesson notebooks import besides the library itself.

* :mod:`.exercises`: ``check``, ``check_solution``, ``solution``, ``hints``: every "Your turn" exercise.
* :mod:`.checking`: the registry and the Yours / Spec comparison the checkers share.
* :mod:`.flash_checks`: the checkers of the FlashAttention kernel exercises (values against float64,
  bytes against the IO model, the simulator's access trace and race detector, named mistakes).
* :mod:`.flash_solutions`: their packaged solutions and the kernel frames the smaller ones plug into.
* :mod:`.bugzoo`: lesson 11's kernels with one classic bug each.
* :mod:`.pictures`, :mod:`.lessonkit`: the lessons' figures and small cell helpers.
* :mod:`.tensor_cores`, :mod:`.decoding`: lessons 13 and 14 (the mma fragment map, split-KV decoding): their
  exercises, pictures and recorded H200 results.
* :mod:`.recorded`: results measured on an NVIDIA H200, shipped in ``data/`` with their provenance.

Imports run one way, with no circle: ``exercises`` imports the checkers (which register themselves),
``flash_checks`` and ``bugzoo`` import ``flash_solutions`` and ``checking``, and those import only the
library (``reference``, ``iomodel``, ``device``, the simulator add-ons).
"""
