"""griffe extensions for two conventions of specjax's docstrings (mkdocs.yml loads both).

`GroupedParams`: related parameters are documented together (`target, target_params: the
model served.`). griffe's Google parser reads such an entry as one parameter named "target,
target_params", and its `warn_unknown_params` check warns that no parameter has that name;
mkdocs.yml turns that check off and this extension does it instead: every name of every Args
entry of every function and class in the package must be a parameter of the signature, or the
build warns (an error under `mkdocs build --strict`). The entries render as written.

`IndentedExamples`: examples, formulas and aligned tables are set off by a two-space indent,
which reads best as plain text (`help()`, an editor); Markdown needs four spaces or a fence to
keep their lines, so each such block is fenced. A block is a run of lines indented by two or
more spaces after a blank line, outside a section's body (Args:, Returns:, ...), not starting
with a list item.
"""

import re

import griffe

_SECTION = re.compile(r"^[A-Z][A-Za-z ]*:\s*$")   # "Args:", "Returns:", ... at the left margin
_LIST_ITEM = re.compile(r"^\s*([*+-]|\d+[.)])\s")


def _objects(obj):
  """Every module, class and function under `obj`, where it is defined (aliases skipped)."""
  for member in obj.members.values():
    if member.is_alias:
      continue
    yield member
    if member.is_module or member.is_class:
      yield from _objects(member)


class GroupedParams(griffe.Extension):

  def on_package(self, *, pkg, **kwargs):
    for obj in _objects(pkg):
      if not (obj.is_function or obj.is_class) or obj.docstring is None:
        continue
      try:
        signature = {p.name.lstrip("*") for p in obj.parameters}
      except (AttributeError, ValueError):
        continue
      for section in griffe.parse_google(obj.docstring, warnings=False):
        if section.kind is not griffe.DocstringSectionKind.parameters:
          continue
        for entry in section.value:
          for name in (n.strip().lstrip("*") for n in entry.name.split(",")):
            if name not in signature:
              griffe.logger.warning(f"{obj.relative_filepath}:{obj.lineno}: {obj.path}: its Args "
                                    f"name '{name}', which is not a parameter of the signature")

  on_package_loaded = on_package   # the event's name before griffe 2


def fence_indented_blocks(text: str) -> str:
  """`text` with each two-space-indented block of its prose fenced (the module doc)."""
  lines, out, i, in_section, in_fence = text.split("\n"), [], 0, False, False
  while i < len(lines):
    line = lines[i]
    if line.lstrip().startswith("```"):
      in_fence = not in_fence   # a fence of its own (or one fenced here already): kept
    elif line.strip() and not line.startswith(" "):
      in_section = bool(_SECTION.match(line))
    if (in_fence or in_section or not line.startswith("  ") or not line.strip()
        or _LIST_ITEM.match(line) or (i > 0 and lines[i - 1].strip())):
      out.append(line)
      i += 1
      continue
    j = i
    while j < len(lines) and (lines[j].startswith("  ") or not lines[j].strip()):
      j += 1
    while not lines[j - 1].strip():
      j -= 1
    block = lines[i:j]
    indent = min(len(b) - len(b.lstrip()) for b in block if b.strip())
    out += ["```", *(b[indent:] for b in block), "```"]
    i = j
  return "\n".join(out)


class IndentedExamples(griffe.Extension):

  def on_package(self, *, pkg, **kwargs):
    for obj in [pkg, *_objects(pkg)]:
      if obj.docstring is not None:
        obj.docstring.value = fence_indented_blocks(obj.docstring.value)

  on_package_loaded = on_package
