"""Shared spine: what opscan does with text that comes from somewhere else (issue 27).

A bundle folder copied back from a Mac, a colleague's report, a zoo manifest, an acceptance spec and the names
inside a user's model are data opscan did not write in this run. Every path through opscan that touches them
goes through one of three doors, each in one place:

- read.py: the one reader for YAML and JSON files opscan did not write itself (size, nesting and YAML alias
  limits, strict UTF-8; each failure one line naming the file, exit 2);
- names.py: the one sanitiser for file and folder names derived from user-controlled text (model class names,
  op names, zoo titles): no `..`, no separators, no control characters, bounded length;
- text.py: the escapers every writer uses for the text it embeds (console, XML, HTML/JS data blocks, CSV,
  Markdown and its comments).

Standard library only (yaml imported lazily, for YAML files): no stage imports here, and no torch.
"""
