"""modprobe.d and the kernel command line as kmod reads them: options, blacklists, softdeps and
install commands for the simulated kernel's modules (a part of Hw)."""

from __future__ import annotations

from .kofile import ko_info, norm
from .machine import Machine


class ModprobeConfig(Machine):
    """What kmod's configuration says about each module (a part of Hw, through KernelModules)."""

    def modprobe_conf(self, texts: dict[str, str] | None = None) -> dict:
        """options/blacklist/softdep/install from modprobe.d (+ the kernel command line).

        As kmod reads them (libkmod-config.c): every file by its name, across the directories,
        with the kernel's modules.softdep (what depmod wrote from the modules' own
        MODULE_SOFTDEP) sorted in among them by its name; of a module's install and softdep
        lines only the first counts (libkmod-module.c: "find only the first command").

        texts: {path: content} of modprobe.d files to use instead of the root's (an initramfs).
        """
        if texts is None:
            texts = {}
            for d in ("lib/modprobe.d", "usr/lib/modprobe.d", "run/modprobe.d", "etc/modprobe.d"):
                for f in sorted(self.p(d).glob("*.conf")) if self.p(d).is_dir() else []:
                    texts[f"/{d}/{f.name}"] = f.read_text(errors="replace")
        files: dict[str, str] = {}
        for path, text in texts.items():  # later directories override same-named files, like kmod
            files[path.rsplit("/", 1)[-1]] = text
        files.setdefault("modules.softdep", self.module_softdeps())
        conf: dict = {"options": {}, "blacklist": set(), "softdep": {}, "install": {}}
        for name in sorted(files):
            text = files[name].replace("\\\n", " ")
            for raw in text.splitlines():
                words = raw.split("#", 1)[0].split()
                if len(words) < 2:
                    continue
                verb, mod = words[0], norm(words[1])
                if verb == "options":
                    conf["options"].setdefault(mod, []).extend(words[2:])
                elif verb == "blacklist":
                    conf["blacklist"].add(mod)
                elif verb == "install":
                    conf["install"].setdefault(mod, " ".join(words[2:]))
                elif verb == "softdep":
                    pre, post, where = [], [], None
                    for w in words[2:]:  # kmod splits on white space only: "a,b" is one name
                        if w in ("pre:", "post:"):
                            where = pre if w == "pre:" else post
                        elif where is not None:
                            where.append(norm(w))
                    conf["softdep"].setdefault(mod, (pre, post))
        for word in self.state.get("cmdline", "").split():
            key, _, value = word.partition("=")
            if key == "modprobe.blacklist":
                conf["blacklist"].update(norm(m) for m in value.split(","))
            elif "." in key and value and not key.startswith(("iommu", "pci")):
                mod, _, param = key.partition(".")
                conf["options"].setdefault(norm(mod), []).append(f"{param}={value}")
        return conf

    def module_softdeps(self) -> str:
        """The kernel's modules.softdep: the file depmod wrote, else what it would write (one
        line per module's first MODULE_SOFTDEP value)."""
        path = self.p(f"lib/modules/{self.kernel}/modules.softdep")
        if path.is_file():
            return path.read_text(errors="replace")
        base = self.p(f"lib/modules/{self.kernel}")
        lines = []
        for ko in sorted(base.rglob("*.ko")) if base.is_dir() else []:
            value = ko_info(ko).get("softdep")
            if value:
                lines.append(f"softdep {norm(ko.stem)} {value}")
        return "".join(f"{line}\n" for line in lines)
