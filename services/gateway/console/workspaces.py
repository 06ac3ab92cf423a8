"""Which workspaces the console lists for a principal: the one function to switch to the
``list workspaces`` op once it exists."""

from __future__ import annotations

from services.gateway.principals import Access, Principal


async def known_workspaces(access: Access, principal: Principal) -> list[str]:
    """The names of the principal's tenant's workspaces it may reach: its own (a pinned
    token's only one), and those of its tenant this gateway has opened so far."""
    names = {principal.workspace}
    if not principal.pinned:
        prefix = f"{principal.tenant}/"
        names |= {key[len(prefix) :] for key in access._ready if key.startswith(prefix)}
    return sorted(names)
