"""Typed schema of ``params.yaml``, validated before any stage does work.

Each stage reads only its own section with its own schema (``load_section("teacher", path,
schema=Teacher)``), so DVC's per-key params tracking, the validation and the code a stage imports agree on
what the stage depends on. A wrong key, type or value raises :class:`~pipeline.errors.UserError` with one
line: ``params.yaml: teacher.train.lr = -1: Input should be greater than 0``.

The modules (this package imports none of them, so that a stage imports only the schemas it reads):

- ``base``: :class:`~pipeline.params.base.Section`, ``bounded()`` and the bounded types, the predictor
  knobs' checks, reading the file and validating one section (``load_section``, ``validate_section``);
- ``training``: ModelShape, Training, Evaluation, Distillation, shared by the training stages' schemas;
- one module per section: ``prepare``, ``pretrain``, ``teacher``, ``extract``, ``project``, ``cluster``,
  ``evaluate``, ``configure``, ``par_search``, ``student``, ``report``;
- ``sections``: every section's schema by name (``SECTIONS``), the whole file validated at once
  (``load_all``, for ``sparsefinder params``), and ``load_section(name, path)`` by name.

The rules:

- Types are strict: a YAML ``true`` or ``"4"`` is not an int, a bool or a string is not a float (an int is:
  ``lr: 1``), and an int is not a string. ``1e-3`` is a float, as YAML 1.2 (and DVC, which reads the same
  file) has it, though PyYAML's YAML 1.1 would read a string. Unknown keys are errors.
- A key given twice in one mapping, at any depth, is an error naming the key and both lines (PyYAML would
  keep the last silently). Otherwise the file is read exactly like ``yaml.safe_load`` reads it, ``<<``
  merge keys included.
- Numbers mean something: a float must be finite (``.nan`` and ``.inf`` are refused wherever a number is
  meant, knob grids included), and an integer that sizes a tensor, a loop or a file has a generous upper
  bound (``bounded``) that names the memory it would take, so a slip of the keyboard is one line rather
  than an allocation error deep inside a stage.
- The file itself is read defensively: it must be UTF-8, nested at most ``MAX_DEPTH`` levels, and its
  aliases may not expand past ``MAX_NODES`` values (a "billion laughs" file is one line, not a hang).
- Every section must be present: a missing one is an error rather than silently all defaults, so a
  truncated or misspelt file never runs a stage on settings nobody wrote. A section given but empty
  (``prepare: {}`` or a bare ``prepare:``) is written on purpose and means all defaults.
"""
