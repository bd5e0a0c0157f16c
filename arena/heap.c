/* heap.c: host allocations after create, served by a jemalloc arena whose extent hooks hand
 * out a bump region of the pinned slab. The hooks never call malloc and never free. */
#include <jemalloc/jemalloc.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "lib/internal.h"

struct fattn__heap {
  extent_hooks_t hooks; /* first: jemalloc passes &hooks back to every hook */
  uint8_t *base;
  uint64_t bytes;
  uint64_t used;
  unsigned arena;
};

static void *hook_alloc(extent_hooks_t *h, void *new_addr, size_t size, size_t alignment,
                        bool *zero, bool *commit, unsigned arena_ind) {
  FATTN__UNUSED(arena_ind);
  fattn__heap *heap = (fattn__heap *)h;
  uint64_t start = fattn__align_up((uint64_t)(uintptr_t)(heap->base + heap->used), alignment);
  uint64_t off = start - (uint64_t)(uintptr_t)heap->base;
  if (new_addr && (uintptr_t)new_addr != start) return NULL; /* no extent grows in place */
  if (off > heap->bytes || size > heap->bytes - off) return NULL;
  heap->used = off + size;
  *zero = true; /* the slab was zeroed at create and nothing is handed out twice */
  *commit = true;
  return (void *)(uintptr_t)start;
}

/* Opting out of dalloc makes jemalloc retain extents; they return with the slab. */
static bool hook_dalloc(extent_hooks_t *h, void *addr, size_t size, bool committed, unsigned ai) {
  FATTN__UNUSED(h), FATTN__UNUSED(addr), FATTN__UNUSED(size), FATTN__UNUSED(committed), FATTN__UNUSED(ai);
  return true;
}

static void hook_destroy(extent_hooks_t *h, void *addr, size_t size, bool committed, unsigned ai) {
  FATTN__UNUSED(h), FATTN__UNUSED(addr), FATTN__UNUSED(size), FATTN__UNUSED(committed), FATTN__UNUSED(ai);
}

static bool hook_commit(extent_hooks_t *h, void *addr, size_t size, size_t offset, size_t length,
                        unsigned ai) {
  FATTN__UNUSED(h), FATTN__UNUSED(addr), FATTN__UNUSED(size), FATTN__UNUSED(offset),
      FATTN__UNUSED(length), FATTN__UNUSED(ai);
  return false; /* pinned memory is always committed */
}

static bool hook_split(extent_hooks_t *h, void *addr, size_t size, size_t size_a, size_t size_b,
                       bool committed, unsigned ai) {
  FATTN__UNUSED(h), FATTN__UNUSED(addr), FATTN__UNUSED(size), FATTN__UNUSED(size_a),
      FATTN__UNUSED(size_b), FATTN__UNUSED(committed), FATTN__UNUSED(ai);
  return false;
}

static bool hook_merge(extent_hooks_t *h, void *addr_a, size_t size_a, void *addr_b, size_t size_b,
                       bool committed, unsigned ai) {
  FATTN__UNUSED(h), FATTN__UNUSED(addr_a), FATTN__UNUSED(size_a), FATTN__UNUSED(addr_b),
      FATTN__UNUSED(size_b), FATTN__UNUSED(committed), FATTN__UNUSED(ai);
  return false; /* one contiguous slab: neighbours can always merge */
}

/* jemalloc rounds large requests up to a size class (at most 25%), keeps per-allocation
 * headers, and its base blocks for the arena's own metadata take 2 MiB aligned chunks. */
uint64_t fattn__heap_overhead(uint64_t payload_bytes, uint32_t allocations) {
  return fattn__align_up(payload_bytes + payload_bytes / 4 + (uint64_t)allocations * 65536u + (16ull << 20),
                         4096);
}

fattn_status fattn__heap_open(void *base, uint64_t bytes, fattn__heap **out) {
  uint8_t *p = (uint8_t *)base;
  fattn__heap *heap = (fattn__heap *)p; /* the heap record sits at the region's start */
  memset(heap, 0, sizeof *heap);
  heap->hooks.alloc = hook_alloc;
  heap->hooks.dalloc = hook_dalloc;
  heap->hooks.destroy = hook_destroy;
  heap->hooks.commit = hook_commit;
  heap->hooks.split = hook_split;
  heap->hooks.merge = hook_merge;
  heap->base = p;
  heap->bytes = bytes;
  heap->used = fattn__align_up(sizeof *heap, 64);
  extent_hooks_t *hp = &heap->hooks;
  size_t sz = sizeof heap->arena;
  if (mallctl("arenas.create", &heap->arena, &sz, &hp, sizeof hp) != 0) return FATTN_ERR_NOMEM;
  *out = heap;
  return FATTN_OK;
}

/* Line-aligned, so that records of a power-of-two size (the sequences' 32 bytes) never straddle two
 * lines; the 64 KiB each allocation is budgeted above covers the rounding. */
void *fattn__heap_alloc(fattn__heap *heap, size_t bytes) {
  return mallocx(bytes ? bytes : 1,
                 MALLOCX_ARENA(heap->arena) | MALLOCX_TCACHE_NONE | MALLOCX_ZERO | MALLOCX_ALIGN(64));
}

void fattn__heap_close(fattn__heap *heap) {
  if (!heap) return;
  char name[64];
  snprintf(name, sizeof name, "arena.%u.destroy", heap->arena);
  mallctl(name, NULL, NULL, NULL, 0);
}
