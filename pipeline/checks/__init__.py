"""A stage's checks of its params against the inputs they name, run before the stage does any work.

Each module here serves one stage, which calls it first, and ``sparsefinder params``, which calls it too,
so that the command refuses a params file exactly when the stage would. A module has:

- ``check_params(section)``: what needs no input (known predictor names and knobs), always run;
- ``INPUTS``: the section's keys naming the files or folders ``check_inputs`` reads;
- ``check_inputs(section)``: the checks against those inputs (head dims, store splits, centroid counts),
  run by ``sparsefinder params`` only when every input exists; it returns what it loaded, for the stage.

The package itself imports nothing, so a stage depends only on its own module.
"""
