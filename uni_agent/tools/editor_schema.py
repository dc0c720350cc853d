"""The `str_replace_editor` tool as the model sees it: its commands and its function schema."""

from __future__ import annotations

COMMANDS = ("view", "create", "str_replace", "insert", "undo_edit")

SCHEMA: dict = {
    "type": "function",
    "function": {
        "name": "str_replace_editor",
        "description": (
            "View, create and edit files in the workspace. Paths may be absolute or relative to the workspace "
            "root; they must stay inside the workspace.\n"
            "* view: a file is shown with line numbers (like `cat -n`); use view_range [start, end] for a part "
            "(end -1 means to the end). A directory lists its non-hidden entries up to 2 levels deep.\n"
            "* create: write file_text to a new file (it must not exist yet); parent directories are created.\n"
            "* str_replace: replace old_str with new_str. old_str must match exactly one place in the file, "
            "character for character, including whitespace and indentation; include enough surrounding lines "
            "to make it unique. Omitting new_str deletes old_str.\n"
            "* insert: insert new_str after line insert_line (0 inserts at the top of the file).\n"
            "* undo_edit: revert the last create/str_replace/insert made to the file."
        ),
        "parameters": {
            "type": "object",
            "properties": {
                "command": {
                    "type": "string",
                    "enum": list(COMMANDS),
                    "description": "The operation: view, create, str_replace, insert or undo_edit.",
                },
                "path": {
                    "type": "string",
                    "description": "File or directory path, absolute or relative to the workspace root.",
                },
                "file_text": {"type": "string", "description": "create: the whole content of the new file."},
                "old_str": {
                    "type": "string",
                    "description": "str_replace: the exact text to replace; it must occur exactly once.",
                },
                "new_str": {
                    "type": "string",
                    "description": "str_replace: the replacement (default: empty). insert: the text to insert.",
                },
                "insert_line": {
                    "type": "integer",
                    "description": "insert: new_str goes after this line number (0 = before the first line).",
                },
                "view_range": {
                    "type": "array",
                    "items": {"type": "integer"},
                    "minItems": 2,
                    "maxItems": 2,
                    "description": "view: [start, end] line numbers, 1-based and inclusive; end -1 = to the end.",
                },
            },
            "required": ["command", "path"],
        },
    },
}
