"""pvpo.viewer: `pvpo view` - what the agent did, episode by episode, in one self-contained HTML page:
an evaluation folder of `pvpo eval`, two of them side by side (which questions flipped), or a
training run (the episodes each step sampled, its groups' advantages, the reward and validation
curves).

It reads what the other components write and nothing imports it. Exports load on first use.
"""

from pvpo.lazy_exports import lazy_exports

_EXPORTS = {
    "build_page": "page",
    "write_page": "page",
    "save_page": "page",
    "page_data": "page",
    "read_source": "sources",
    "Source": "sources",
    "ViewError": "sources",
    "pair_episodes": "compare",
    "PageServer": "serve",
}

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
__all__ = sorted(_EXPORTS)
