"""The loader's integrations, beside the call path: drop-in patching (``patch``, ``hook``, ``report``),
measurement and tuning (``bench``, ``tune``), checking a bundle on this machine (``inspect``, ``verify``) and the
``flyship`` command line (``cli``). The call path (``flyship.loader``: load, handles, selection, plan, extension)
never imports this package; these modules import the call path.
"""
