# SPDX-License-Identifier: MIT
"""The pure core: key rules, fingerprints, the result codec and the record state machine.

Invariant: nothing in this package performs I/O, reads a clock, or imports anything
else from onceonly. Times are passed in as epoch seconds measured on the store's clock.
"""
