"""Build hook: an editable install gets the start-up hook's .pth only, not a copy of tasks/.

The wheel carries ``tasks/`` inside the package (``force-include`` in pyproject.toml); an
editable install must read the checkout's own ``tasks/`` (``lm_eval_sinkmask/tasks.py``), so
a copy in site-packages would only go stale.
"""

from hatchling.builders.hooks.plugin.interface import BuildHookInterface


class CustomBuildHook(BuildHookInterface):
    def initialize(self, version, build_data):
        if version == "editable":
            build_data["force_include_editable"] = {"lm_eval_sinkmask.pth": "lm_eval_sinkmask.pth"}
