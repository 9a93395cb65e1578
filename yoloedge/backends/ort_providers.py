"""The execution-provider entry handed to ONNX Runtime: option names and spellings by EP and version.

Three things here are easy to get wrong and only show on the hardware:

* **Option spellings.** The Python layer converts every value with `str()`, and the TensorRT EP's
  Python option parser accepts only `True`/`true`/`False`/`false` for its flags (it throws "should
  be 'True' or 'False'" for `1`), while the CUDA and MIGraphX EPs parse flags with
  `parse_string`, which takes `0`/`1` and `True`/`False` alike. `True`/`False` is the spelling all
  of them accept, so flags we set, and boolean values from the config, are written that way.
* **Option names by version.** ONNX Runtime <= 1.22 caches a compiled MIGraphX program in one file
  (`migraphx_save_compiled_model` + `migraphx_save_model_path`, `migraphx_load_compiled_model` +
  `migraphx_load_model_path`); 1.23 removed those keys for `migraphx_model_cache_dir`. An EP
  refuses a key it does not know, so the installed version decides.
* **Device memory naming.** OrtValues and IOBinding call every GPU "cuda", AMD's included (the
  Python layer maps "cuda" to the generic GPU device; AMD's own MIGraphX scripts bind 'cuda').
"""

from __future__ import annotations

import os
import re
from typing import Mapping

from ..config.providers import PROVIDERS

#: the first ONNX Runtime release with `migraphx_model_cache_dir` (and without save/load keys).
MIGRAPHX_CACHE_DIR_SINCE = (1, 23)
#: the file a <= 1.22 MIGraphX EP saves its compiled program to, inside the cache folder.
MIGRAPHX_PROGRAM_FILE = "model.mxr"
TRUE_WORDS = ("1", "true", "yes", "on")


def parse_version(text: str) -> tuple[int, int, int]:
    """(major, minor, patch) of an `onnxruntime.__version__` such as "1.22.2.post1" or "1.24.0.dev20251"."""
    numbers = [int(n) for n in re.findall(r"\d+", text)[:3]]
    if len(numbers) < 2:
        raise ValueError(f"not an ONNX Runtime version: {text!r}")
    major, minor, *rest = numbers
    return major, minor, rest[0] if rest else 0


def option_text(value: object) -> str:
    """A provider-option value as the EPs read it: flags as True/False (see the module docstring)."""
    if isinstance(value, bool):
        return "True" if value else "False"
    return str(value)


def is_set(value: object) -> bool:
    """Whether a provider-option flag, as the config gave it (true, 1, "1", "True"), is on."""
    if isinstance(value, bool):
        return value
    return str(value).strip().lower() in TRUE_WORDS


def precision(provider: str, options: Mapping[str, object]) -> str:
    """The precision an EP compiles for, from its options: "fp32", or the reduced ones joined by '+'."""
    reduced = [name for key, name in PROVIDERS[provider].precision_options if is_set(options.get(key, False))]
    return "+".join(reduced) or "fp32"


def migraphx_cache_options(version: tuple[int, int, int], folder: str) -> dict[str, str]:
    """The MIGraphX EP keys that keep its compiled program in `folder`, for ONNX Runtime `version`.

    Before 1.23 the EP saves to or loads from one file and takes one of the two per session (a
    session asking for both is refused in some releases): load when the file is there, else
    compile and save it. The folder is per model hash, shape and precision (`ort_cache`), so a file
    found there is the program for this model."""
    if version[:2] >= MIGRAPHX_CACHE_DIR_SINCE:
        return {"migraphx_model_cache_dir": folder}
    program = os.path.join(folder, MIGRAPHX_PROGRAM_FILE)
    if os.path.isfile(program):
        return {"migraphx_load_compiled_model": "True", "migraphx_load_model_path": program}
    return {"migraphx_save_compiled_model": "True", "migraphx_save_model_path": program}


def tensorrt_cache_options(folder: str) -> dict[str, str]:
    """Engine and timing caches in `folder`: the engine is built once per cache key, and the timing
    cache speeds up a build for another batch or precision of a similar model."""
    return {
        "trt_engine_cache_enable": "True",
        "trt_engine_cache_path": folder,
        "trt_timing_cache_enable": "True",
        "trt_timing_cache_path": folder,
    }


def cache_options(provider: str, version: tuple[int, int, int], folder: str) -> dict[str, str]:
    """The keys that put `provider`'s compiled engine/program in `folder`; {} for one that compiles nothing."""
    if provider == "tensorrt":
        return tensorrt_cache_options(folder)
    if provider == "migraphx":
        return migraphx_cache_options(version, folder)
    return {}


def provider_entry(provider: str, device_id: int, user_options: Mapping[str, object],
                   cache: Mapping[str, str]) -> str | tuple[str, dict[str, str]]:
    """The `providers=` entry for `provider`: its name, or (name, options) for a GPU provider.

    The config's own `provider_options` win over the cache keys we add, so an operator can still
    point the engine cache elsewhere."""
    name = PROVIDERS[provider].ort_name
    if provider == "cpu":
        return name
    options = {"device_id": str(device_id), **cache}
    options.update({key: option_text(value) for key, value in user_options.items()})
    if provider == "tensorrt":
        options.update({key: flag_word(value) for key, value in options.items() if key.endswith("_enable")})
    return name, options


def flag_word(value: str) -> str:
    """A TensorRT EP flag in the one spelling its parser takes: `trt_fp16_enable: "1"`, the spelling
    the CUDA and MIGraphX EPs document, would otherwise fail the session with "should be 'True' or
    'False'". Anything else is left for the EP to refuse in its own words."""
    word = value.strip().lower()
    if word in ("1", "true"):
        return "True"
    if word in ("0", "false"):
        return "False"
    return value
