"""Reading compiled HLO text (what XLA made of a jitted function).

`computations` splits a module's text into its computations; `while_bodies` names the bodies of
its `while` loops (what runs once per decoding step).
"""

from __future__ import annotations

import re
from typing import Dict, List, Set

__all__ = ["computations", "while_bodies"]


def computations(hlo: str) -> Dict[str, List[str]]:
  """{computation name: its instruction lines} of an HLO module's text."""
  comps, name = {}, None
  for line in hlo.splitlines():
    head = re.match(r"^(?:ENTRY )?%([\w.-]+) ", line)
    if head:
      name = head.group(1)
      comps[name] = []
    elif name is not None:
      comps[name].append(line)
  return comps


def while_bodies(hlo: str) -> Set[str]:
  """Names of the computations that are `while` loop bodies."""
  return set(re.findall(r"body=%([\w.-]+)", hlo))
