"""gpuhost twin: the part of the systemctl shim that reads a service as systemd does and runs a
Type=simple unit's process (systemd.unit(5): drop-ins; systemd.service(5) and systemd.exec(5):
ExecStart= expansion, Environment=, EnvironmentFile=, User=). Installed beside twinreq.py in
/usr/lib/gpuhost-twin; shims/systemctl imports it."""

import glob
import os
import pwd
import re
import shlex
import time

UNIT_DIRS = (
    "/etc/systemd/system",
    "/run/systemd/system",
    "/usr/lib/systemd/system",
    "/lib/systemd/system",
)
RUN = "/run/gpuhost-twin/systemd"


def service_keys(path):
    """The [Service] keys of a unit file and of its drop-ins (systemd.unit(5): <unit>.d/*.conf
    in the unit directories, read after the file in the order of their names; a name in /etc
    hides the same name further down). An empty value resets a list (ExecStart= then
    ExecStart=...: a drop-in's own command line)."""
    unit = os.path.basename(path)
    dropins = {}
    for d in reversed(UNIT_DIRS):
        for conf in glob.glob(os.path.join(d, f"{unit}.d", "*.conf")):
            dropins[os.path.basename(conf)] = conf
    keys = {}
    for source in (path, *(dropins[n] for n in sorted(dropins))):
        section = ""
        with open(source) as f:
            for line in f:
                line = line.strip()
                if line.startswith("["):
                    section = line
                elif section == "[Service]" and "=" in line and not line.startswith(("#", ";")):
                    key, _, value = line.partition("=")
                    if value.strip():
                        keys.setdefault(key.strip(), []).append(value.strip())
                    else:
                        keys[key.strip()] = []
    return keys


def environment(keys):
    """A service's environment: systemd's plain one, Environment=, then EnvironmentFile= (whose
    values win, systemd.exec(5)); KEY=VALUE lines, '#' comments, quotes around a value removed,
    a '-' before the file's name: optional."""
    env = {
        "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        "LANG": "C.UTF-8",
    }
    for item in keys.get("Environment", []):
        for word in shlex.split(item):
            if "=" in word:
                k, v = word.split("=", 1)
                env[k] = v
    for item in keys.get("EnvironmentFile", []):
        optional, path = item.startswith("-"), item.lstrip("-")
        try:
            with open(path) as f:
                lines = f.read().splitlines()
        except OSError:
            if optional:
                continue
            raise
        for line in lines:
            line = line.strip()
            if line and not line.startswith(("#", ";")) and "=" in line:
                k, v = line.split("=", 1)
                v = v.strip()
                if len(v) >= 2 and v[0] == v[-1] and v[0] in "'\"":
                    v = v[1:-1]
                env[k.strip()] = v
    return env


def command_line(line, env):
    """ExecStart= words as systemd.service(5) expands them: $NAME alone as a word becomes the
    variable's value split at whitespace (none when it is empty), ${NAME} its value as is."""
    argv = []
    for word in shlex.split(line.lstrip("-@+!:")):
        alone = re.fullmatch(r"\$([A-Za-z_][A-Za-z0-9_]*)", word)
        if alone:
            argv += env.get(alone[1], "").split()
            continue
        argv.append(re.sub(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}", lambda m: env.get(m[1], ""), word))
    return argv


def main_pid(unit):
    """The PID a Type=simple unit's start recorded, or None."""
    try:
        with open(os.path.join(RUN, f"{unit}.pid")) as f:
            return int(f.read().strip())
    except (OSError, ValueError):
        return None


# The machine's procfs (twin/mounts.py): the twin's own /proc links a new process only within
# the supervisor's tick (twin/procview.py).
KERNEL_PROC = "/run/gpuhost-twin/proc" if os.path.isdir("/run/gpuhost-twin/proc/self") else "/proc"


def alive(pid):
    try:
        with open(f"{KERNEL_PROC}/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def start_simple(unit, keys):
    """Start a Type=simple unit's process (its last ExecStart=) in a session of its own, as its
    User=, with the unit's environment, output to /run/gpuhost-twin/systemd/<unit>.log (the
    journal's stand-in); record its PID. None when it runs, "exited" when it ended at once with
    status 0 (inactive, as systemd shows it), else the failure record."""
    running = main_pid(unit)
    if running is not None and alive(running):
        return None  # start of an active unit does nothing
    env = environment(keys)
    argv = command_line(keys["ExecStart"][-1], env)
    user = keys.get("User", ["root"])[-1]
    entry = pwd.getpwnam(user)
    os.makedirs(RUN, exist_ok=True)
    log_path = os.path.join(RUN, f"{unit}.log")
    log = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    child = os.fork()
    if child == 0:
        try:
            os.setsid()
            os.chdir("/")
            null = os.open("/dev/null", os.O_RDONLY)
            os.dup2(null, 0)
            os.dup2(log, 1)
            os.dup2(log, 2)
            os.setgid(entry.pw_gid)
            os.initgroups(user, entry.pw_gid)
            os.setuid(entry.pw_uid)
            os.execve(argv[0], argv, {**env, "HOME": entry.pw_dir, "USER": user})
        finally:
            os._exit(127)
    os.close(log)
    with open(os.path.join(RUN, f"{unit}.pid"), "w") as f:
        f.write(f"{child}\n")
    time.sleep(0.5)
    done, status = os.waitpid(child, os.WNOHANG)
    if done == 0:
        return None
    if os.waitstatus_to_exitcode(status) == 0:
        return "exited"
    with open(log_path) as f:
        output = f.read()[-2000:]
    return f"status={os.waitstatus_to_exitcode(status)}\n{output}"
