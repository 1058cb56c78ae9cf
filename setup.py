"""How the repository's files are laid into the package; pyproject.toml says what the package is.

The installed `receipts` reads two things the repository keeps outside the package: Alembic's `migrations/`
(at the top of the repository, where the design puts it) and `config.yaml`, the default config. A wheel has no
repository beside it, so both go inside the package: `migrations/` as the package `proxy_addon.migrations`
(setuptools maps it by `package_dir`: the sdist keeps it at the top, the wheel has it inside), `config.yaml` as
`proxy_addon/config.example.yaml` (for `receipts init`). pyproject.toml cannot map a folder into a package or
copy a file from outside one, hence this file. `proxy_addon/resources.py` finds both in a wheel and in a checkout.
"""

import os

from setuptools import find_namespace_packages, setup
from setuptools.command.build_py import build_py

EXAMPLE_CONFIG = "config.yaml"  # in the repository
PACKAGED_EXAMPLE_CONFIG = os.path.join("proxy_addon", "config.example.yaml")  # in the built package


class BuildPyWithExampleConfig(build_py):
    """build_py, and the default config copied into the built package (and listed among the sdist's sources)."""

    def run(self) -> None:
        super().run()
        if not self.editable_mode:  # an editable install reads the repository's own config.yaml
            self.copy_file(EXAMPLE_CONFIG, self._example_config_target())

    def get_source_files(self) -> list[str]:
        return [*super().get_source_files(), EXAMPLE_CONFIG]

    def get_outputs(self, include_bytecode: bool = True) -> list[str]:
        return [*super().get_outputs(include_bytecode), self._example_config_target()]

    def get_output_mapping(self) -> dict[str, str]:
        return {**super().get_output_mapping(), self._example_config_target(): EXAMPLE_CONFIG}

    def _example_config_target(self) -> str:
        return os.path.join(self.build_lib, PACKAGED_EXAMPLE_CONFIG)


setup(
    packages=[
        *find_namespace_packages(include=["proxy_addon", "proxy_addon.*"], exclude=["*.__pycache__"]),
        "proxy_addon.migrations",
        "proxy_addon.migrations.versions",
    ],
    package_dir={"proxy_addon.migrations": "migrations"},
    package_data={
        "proxy_addon": ["templates/*.html"],  # the review page's
        "proxy_addon.presets": ["*.yaml"],  # the presets' rules (`preset: NAME` on a host)
        "proxy_addon.migrations": ["script.py.mako"],  # the template `alembic revision` writes a migration from
    },
    cmdclass={"build_py": BuildPyWithExampleConfig},
)
