"""Fake `acl.prof`: the profiling calls yoloedge makes, recorded in `STATE.prof`.

pyACL (prof_wrap.cpp): init(path) -> ret; create_config(device_list, aicore_metrics,
aicore_events, data_type_config) -> config (bare; 0 when refused; device_list must be a list of
ints); start(config) / stop(config) / destroy_config(config) -> ret; finalize() -> ret. The fake
refuses a second init, start before init, an unknown config, and finalize while a config is
started; it writes `fake-msprof.json` into the folder at stop (where msprof would put its data).
"""

from __future__ import annotations

import json
import os

from ._fake import INVALID_PARAM, Refused, api, need_int


def _prof(state) -> dict:
    return state.__dict__.setdefault("prof_session", {"dir": None, "configs": {}, "started": set()})


@api("acl.prof.init", "ret")
def init(state, path):
    if not isinstance(path, str):
        raise TypeError("path must be a str")
    session = _prof(state)
    if session["dir"] is not None:
        raise Refused(INVALID_PARAM, "acl.prof.init twice")
    if not os.path.isdir(path):
        raise Refused(INVALID_PARAM, f"no folder {path}")
    session["dir"] = path
    state.prof.append(("init", path))


@api("acl.prof.create_config", "bare", default=0)
def create_config(state, devices, aicore_metrics, aicore_events, data_types):
    if not isinstance(devices, list) or not all(isinstance(d, int) for d in devices):
        raise TypeError("the first argument is not list of int")
    need_int(aicore_metrics, aicore_events, data_types)
    config = state.handle()
    _prof(state)["configs"][config] = (list(devices), aicore_metrics, data_types)
    state.prof.append(("create_config", list(devices), aicore_metrics, data_types))
    return config


def _config(state, config) -> dict:
    need_int(config)
    session = _prof(state)
    if config not in session["configs"]:
        raise Refused(INVALID_PARAM, "unknown profiling config")
    return session


@api("acl.prof.start", "ret")
def start(state, config):
    session = _config(state, config)
    if session["dir"] is None:
        raise Refused(INVALID_PARAM, "acl.prof.start before acl.prof.init")
    session["started"].add(config)
    state.prof.append(("start", config))


@api("acl.prof.stop", "ret")
def stop(state, config):
    session = _config(state, config)
    if config not in session["started"]:
        raise Refused(INVALID_PARAM, "acl.prof.stop of a config not started")
    session["started"].discard(config)
    state.prof.append(("stop", config))
    marker = os.path.join(session["dir"], "fake-msprof.json")
    with open(marker, "w", encoding="utf-8") as f:
        json.dump({"devices": session["configs"][config][0], "executed_gears": len(state.executed_gears)}, f)


@api("acl.prof.destroy_config", "ret")
def destroy_config(state, config):
    session = _config(state, config)
    if config in session["started"]:
        raise Refused(INVALID_PARAM, "destroy_config of a started config")
    del session["configs"][config]
    state.prof.append(("destroy_config", config))


@api("acl.prof.finalize", "ret")
def finalize(state):
    session = _prof(state)
    if session["dir"] is None or session["started"]:
        raise Refused(INVALID_PARAM, "acl.prof.finalize without init, or while profiling")
    session["dir"] = None
    state.prof.append(("finalize",))
