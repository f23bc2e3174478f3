"""Only what pyproject.toml cannot say: ship ``basecap-lm-eval.pth`` in the wheel, next to the
package, so that ``lm_eval --model basecap`` finds basecap's model class without an import first
(see src/basecap/lm_eval_plugin.py; editable installs get it from ``basecap.lm_eval_plugin.main()``,
which scripts/setup.sh runs)."""

import os

from setuptools import setup
from setuptools.command.build_py import build_py

PTH_NAME = "basecap-lm-eval.pth"
PTH_LINE = "import basecap.lm_eval_plugin as _basecap_plugin; _basecap_plugin.install()\n"  # = lm_eval_plugin.PTH_LINE


class BuildPyWithPth(build_py):
    def run(self):
        super().run()
        with open(os.path.join(self.build_lib, PTH_NAME), "w") as f:
            f.write(PTH_LINE)

    def get_outputs(self, include_bytecode=True):
        return [*super().get_outputs(include_bytecode), os.path.join(self.build_lib, PTH_NAME)]


setup(cmdclass={"build_py": BuildPyWithPth})
