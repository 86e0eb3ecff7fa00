"""verl plugin (entry point `verl.plugins: pvpo`): verl imports it on `import verl` in its driver
and Ray workers, and it registers the `pvpo` advantage estimator there.

verl loads plugins at the end of its `__init__` and logs a failing one at DEBUG only, so the
estimator's registration is checked where it is used: with `algorithm.adv_estimator=pvpo`, verl
raises "Unknown advantage estimator" if this module did not load. To load it without the entry
point: `VERL_USE_EXTERNAL_MODULES=pvpo.integrations.verl.plugin`.
"""

from pvpo.integrations.verl.estimator import register

register()
