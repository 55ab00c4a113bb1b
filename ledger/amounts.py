"""The largest amount one call may move, shared by the ledger services, the API and the admin.

10^15 micro-credits is a billion credits: more than any real purchase, and far enough below a
64-bit column (9.2 * 10^18) that thousands of such issues to one org still sum without overflow.
Pure Python (no Django import), so serializers and forms can import it at module load.
"""

MAX_AMOUNT = 10**15
