"""The tools a model can be given, by name (an agent's `tools:` list names them; config validates against TOOLS).

Entries are "module:Class" paths imported on first use, so config can check names without importing sandboxes. A
new tool is one module with a class that has ToolClass's shape (uni_agent.tools.base) and one line here. From outside
the package, an agent's `tools:` names it by import path (`- name: mypkg.tools:Grep`), imported where the rollout runs,
so it reaches every worker that can import `mypkg`; the model calls it by its SCHEMA's function name. (A
`TOOLS.register(name, cls)` call reaches only the process that makes it.) The order is the default tool list's order."""

from __future__ import annotations

from typing import Any

from ..registry import Registry

TOOLS: Registry[Any] = Registry("tool", {
    "str_replace_editor": "uni_agent.tools.str_replace_editor:StrReplaceEditorTool",
    "execute_bash": "uni_agent.tools.execute_bash:ExecuteBash",
    "submit": "uni_agent.tools.submit:Submit",
})
