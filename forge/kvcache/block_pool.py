"""A pool of KV blocks with an O(1) free queue and an LRU-evicted prefix cache (vLLM V1 style); without
prefix caching the free queue is a list."""

from __future__ import annotations

import itertools
from collections.abc import Iterator


class Block:
    __slots__ = ("block_hash", "block_id", "next", "prev", "ref_cnt")

    def __init__(self, block_id: int) -> None:
        self.block_id = block_id
        self.ref_cnt = 0
        self.block_hash: int | None = None
        self.prev: Block | None = None
        self.next: Block | None = None


class FreeBlockQueue:
    """Doubly linked list of free blocks: pop the head, append to the tail, remove any, all O(1).

    Free blocks that still hold cached KV stay evictable: the head is the least recently
    freed, so popping it evicts the least recently used cached block first.
    """

    def __init__(self, blocks: list[Block]) -> None:
        self._head = Block(-1)
        self._tail = Block(-1)
        self._head.next = self._tail
        self._tail.prev = self._head
        self.size = 0
        for b in blocks:
            self.append(b)

    def popleft(self) -> Block:
        block = self._head.next
        if block is None or block is self._tail:
            raise IndexError("no free blocks")
        self.remove(block)
        return block

    def popleft_n(self, n: int) -> list[Block]:
        """The ``n`` blocks at the head, in order, unlinked at once (``n`` <= ``size``)."""
        if n > self.size:
            raise IndexError(f"{n} blocks asked, {self.size} free")
        out = []
        block = self._head.next
        for _ in range(n):
            assert block is not None
            out.append(block)
            block.prev, block = None, block.next
        for b in out:
            b.next = None
        self._head.next = block
        assert block is not None
        block.prev = self._head
        self.size -= n
        return out

    def append(self, block: Block) -> None:
        last = self._tail.prev
        assert last is not None
        last.next = block
        block.prev = last
        block.next = self._tail
        self._tail.prev = block
        self.size += 1

    def extend(self, blocks: list[Block]) -> None:
        """``append`` each of ``blocks`` in order (linked in one pass)."""
        last = self._tail.prev
        assert last is not None
        for block in blocks:
            last.next = block
            block.prev = last
            last = block
        last.next = self._tail
        self._tail.prev = last
        self.size += len(blocks)

    def remove(self, block: Block) -> None:
        prev, nxt = block.prev, block.next
        assert prev is not None and nxt is not None, f"block {block.block_id} is not in the free queue"
        prev.next = nxt
        nxt.prev = prev
        block.prev = block.next = None
        self.size -= 1

    def __contains__(self, block: Block) -> bool:
        return block.prev is not None

    def __iter__(self) -> Iterator[Block]:
        """Head (next to evict) to tail."""
        block = self._head.next
        while block is not None and block is not self._tail:
            yield block
            block = block.next


class FreeBlockList:
    """``FreeBlockQueue``'s queue for a pool without prefix caching, in the same order (head: the least
    recently freed): a list and the index of its head, so popping ``n`` blocks is one slice and
    appending touches no neighbouring block. The popped part is dropped once it outgrows the rest.
    ``remove`` is O(n); only taking back a free block that still holds cached KV (a prefix-cache hit)
    needs it."""

    def __init__(self, blocks: list[Block]) -> None:
        self._blocks = list(blocks)
        self._head = 0

    @property
    def size(self) -> int:
        return len(self._blocks) - self._head

    def popleft(self) -> Block:
        return self.popleft_n(1)[0]

    def popleft_n(self, n: int) -> list[Block]:
        """The ``n`` blocks at the head, in order (``n`` <= ``size``)."""
        head = self._head
        if n > len(self._blocks) - head:
            raise IndexError(f"{n} blocks asked, {len(self._blocks) - head} free")
        out = self._blocks[head : head + n]
        head += n
        if head > _COMPACT_MIN and 2 * head > len(self._blocks):
            del self._blocks[:head]
            head = 0
        self._head = head
        return out

    def append(self, block: Block) -> None:
        self._blocks.append(block)

    def extend(self, blocks: list[Block]) -> None:
        self._blocks += blocks

    def remove(self, block: Block) -> None:
        for i in range(self._head, len(self._blocks)):
            if self._blocks[i] is block:
                del self._blocks[i]
                return
        raise AssertionError(f"block {block.block_id} is not in the free queue")

    def __contains__(self, block: Block) -> bool:
        return any(b is block for b in self)

    def __iter__(self) -> Iterator[Block]:
        """Head (next to evict) to tail."""
        return itertools.islice(self._blocks, self._head, None)


_COMPACT_MIN = 1024  # ``FreeBlockList`` drops its popped part once it is longer than this and than the rest


class BlockPool:
    """Owns every block: reference counts, the free queue and the hash -> block map.
    ``num_shared``: blocks with more than one holder (while 0, no holder needs a per-block pass)."""

    def __init__(self, num_blocks: int, enable_caching: bool) -> None:
        self.blocks = [Block(i) for i in range(num_blocks)]
        # with caching, a free block may be taken back out of the middle (a hit): the linked queue
        self.free_queue: FreeBlockQueue | FreeBlockList = (
            FreeBlockQueue(self.blocks) if enable_caching else FreeBlockList(self.blocks)
        )
        self.enable_caching = enable_caching
        self.cached: dict[int, Block] = {}
        self.num_shared = 0

    @property
    def num_free(self) -> int:
        return self.free_queue.size

    def allocate(self, n: int) -> list[Block] | None:
        if n > self.free_queue.size:
            return None
        out = self.free_queue.popleft_n(n)
        if self.cached:  # evict the cached KV the blocks still hold
            for block in out:
                if block.block_hash is not None:
                    del self.cached[block.block_hash]
                    block.block_hash = None
        for block in out:
            block.ref_cnt = 1
        return out

    def free(self, blocks: list[Block]) -> None:
        """Drop one reference from each, in order; blocks reaching 0 join the queue's tail."""
        if not self.num_shared:  # every held block has one holder: each reaches 0, all join in order
            for block in blocks:
                assert block.ref_cnt == 1, f"block {block.block_id} freed twice"
                block.ref_cnt = 0
            self.free_queue.extend(blocks)
            return
        for block in blocks:
            if block.ref_cnt == 2:
                self.num_shared -= 1
            block.ref_cnt -= 1
            assert block.ref_cnt >= 0, f"block {block.block_id} freed twice"
            if block.ref_cnt == 0:
                self.free_queue.append(block)

    def lookup(self, block_hash: int) -> Block | None:
        return self.cached.get(block_hash)

    def acquire(self, block: Block) -> None:
        """Take a reference to a cached block (a prefix-cache hit)."""
        if block.ref_cnt == 0:
            self.free_queue.remove(block)
        elif block.ref_cnt == 1:
            self.num_shared += 1
        block.ref_cnt += 1

    def uncache(self, block: Block) -> None:
        """Forget the block's hash: no later prefix lookup finds it."""
        if block.block_hash is not None:
            del self.cached[block.block_hash]
            block.block_hash = None

    def cache(self, block: Block, block_hash: int) -> None:
        if not self.enable_caching or block.block_hash is not None:
            return
        if block_hash in self.cached:
            return
        block.block_hash = block_hash
        self.cached[block_hash] = block
