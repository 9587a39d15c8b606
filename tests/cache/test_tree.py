"""The radix tree on its own: paths, splits, checkpoint-exact matches, per-index block tables."""

from flashstate.cache.block_pool import BlockPool
from flashstate.cache.tree import RadixTree


def _tree(num_blocks=64, block_size=4):
    pool = BlockPool(num_blocks, block_size)
    return RadixTree(pool), pool


def test_match_needs_a_checkpoint_at_exactly_the_depth():
    tree, pool = _tree()
    seq = list(range(10))
    blocks = pool.allocate(3)
    node, created = tree.insert(seq, blocks, 10)
    assert created and node.end == 10 and node.blocks == blocks
    assert tree.match(seq + [99]).depth == 0  # KV is there but no checkpoint
    assert tree.match(seq + [99]).kv_depth == 10
    node.slot = 5
    m = tree.match(seq + [99])
    assert (m.depth, m.kv_depth, m.node) == (10, 10, node)
    assert tree.match(seq, limit=9).depth == 0  # the whole request cannot be a hit


def test_split_mid_block_shares_the_straddling_block():
    tree, pool = _tree()
    a = list(range(10))
    blocks = pool.allocate(3)
    leaf, _ = tree.insert(a, blocks, 10)
    leaf.slot = 1
    # A branch leaving `a` after 6 tokens (mid block 1): upper [0,6), lower [6,10).
    b = a[:6] + [50, 51, 52]
    b_blocks = blocks[:1] + pool.allocate(2)  # b's own copy of block index 1 and beyond
    node, created = tree.insert(b, b_blocks, 9)
    upper = node.parent
    assert created and (upper.start, upper.end) == (0, 6) and upper.blocks == blocks[:2]
    assert (leaf.start, leaf.blocks) == (6, blocks[1:])
    assert node.blocks == b_blocks[1:]
    assert pool.ref_counts[blocks[1]] == 3  # upper, lower, and the caller's own reference
    node.slot = 2
    # Each path's table takes, per index, the deepest node's block.
    assert tree.block_table(leaf) == blocks
    assert tree.block_table(node) == b_blocks
    assert tree.match(b + [7]).depth == 9 and tree.match(a + [7]).depth == 10
    assert tree.match(a[:6] + [8]).depth == 0


def test_insert_into_existing_path_creates_nothing_and_cut_at_depth():
    tree, pool = _tree()
    a = list(range(12))
    blocks = pool.allocate(3)
    tree.insert(a, blocks, 12)
    node, created = tree.insert(a, blocks, 12)
    assert not created
    mid, created = tree.insert(a, blocks, 5)  # a checkpoint position inside an edge cuts it there
    assert created and mid.end == 5 and [c.end for c in mid.children.values()] == [12]


def test_exclusive_blocks_and_removal():
    tree, pool = _tree()
    a = list(range(8))
    blocks = pool.allocate(2)
    leaf, _ = tree.insert(a, blocks, 8)
    leaf.slot = 0
    pool.free(blocks)  # the caller's references go: only the tree holds them now
    assert tree.exclusive_blocks(leaf) == 2
    leaf.slot = None
    tree.remove_leaf(leaf)
    assert pool.num_free == pool.num_blocks
