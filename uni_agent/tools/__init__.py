"""The tools the model can call. tool_names.py: the tools by name (config checks names there, so this package's
__init__ imports nothing); base.py: what a tool is; one module per tool (execute_bash, str_replace_editor with its
editor, submit); toolbox.py: a rollout's tools bound to its sandbox, the one place that runs a parsed call."""
