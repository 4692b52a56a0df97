"""common: the shared utilities every layer uses, with no opinion about scoring, environments or training.

    files.py    atomic writes: files (atomic_file, write_text_atomically, write_bytes_atomically) and
                whole directories (write_directory_atomically), never a torn one
    imports.py  'module:function' references resolved to callables (tools, task generators, scorers)
    chat.py     the one rendering of chat messages (render_chat), end-of-turn and stop ids, the pad
                token, model-directory checks (transformers only inside functions)
    lazy.py     a package's public names imported on first use (the one import a package top makes)
    text.py     text from outside (an endpoint's error, a model's output) as one bounded line of plain
                text for a terminal (printable)

The lowest layer: judges, marl and trainers may import it.

May import: the standard library (transformers lazily inside common/chat.py functions); nothing of judges,
marl or trainers.
"""
