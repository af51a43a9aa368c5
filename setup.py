"""Only what pyproject.toml cannot say: kernels/ (at the top of the repository, where kernel authors find
it) is installed as the package netcl.kernels next to the Python code."""
from setuptools import find_packages, setup

setup(
    packages=find_packages(include=["netcl", "netcl.*"]) + ["netcl.kernels"],
    package_dir={"netcl.kernels": "kernels"},
)
