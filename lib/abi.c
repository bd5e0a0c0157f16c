/* abi.c: the versioned structs (struct_size first) across library versions: an older caller's
 * shorter struct reads with its tail at the *_INIT defaults, a newer one's only if its tail is zero. */
#include <stddef.h>
#include <string.h>

#include "lib/internal.h"

/* A caller's struct_size past this is garbage, never a struct: no scan runs that far. */
#define ABI_MAX_SIZE 4096u

static const fattn_config config_init = FATTN_CONFIG_INIT;
static const fattn_model model_init = FATTN_MODEL_INIT;
static const fattn_batch batch_init = FATTN_BATCH_INIT;
static const fattn_stats stats_init = FATTN_STATS_INIT;
static const fattn_memory_report report_init = FATTN_MEMORY_REPORT_INIT;

/* The smallest struct_size: struct_size and the first field after it, which every version has. */
#define ABI(type, first, init, defaults) \
  {#type, #init, sizeof(type), offsetof(type, first) + sizeof(((type *)0)->first), &(defaults)}

const fattn__abi fattn__abi_config = ABI(fattn_config, device, FATTN_CONFIG_INIT, config_init);
const fattn__abi fattn__abi_model = ABI(fattn_model, num_layers, FATTN_MODEL_INIT, model_init);
const fattn__abi fattn__abi_batch = ABI(fattn_batch, mode, FATTN_BATCH_INIT, batch_init);
const fattn__abi fattn__abi_stats = ABI(fattn_stats, pages_total, FATTN_STATS_INIT, stats_init);
const fattn__abi fattn__abi_report = ABI(fattn_memory_report, region_bytes, FATTN_MEMORY_REPORT_INIT, report_init);

static uint32_t user_size(const void *user) {
  uint32_t n;
  memcpy(&n, user, sizeof n); /* struct_size leads every versioned struct */
  return n;
}

/* The rule of Linux's copy_struct_from_user: a shorter struct is an older caller's, a longer
 * one a newer caller's, fine while it sets none of the fields this library does not know. */
fattn_status fattn__abi_check(const fattn__abi *abi, const void *user, char *detail, size_t detail_len) {
  const uint32_t n = user_size(user);
  if (n < abi->min)
    return fattn__failbuf(detail, detail_len, FATTN_ERR_INVALID,
                          "%s struct_size %u: smaller than its first field's end (%u bytes; use %s)", abi->name, n,
                          abi->min, abi->init);
  if (n <= abi->size) return FATTN_OK;
  if (n > ABI_MAX_SIZE)
    return fattn__failbuf(detail, detail_len, FATTN_ERR_INVALID, "%s struct_size %u: over %u bytes (use %s)",
                          abi->name, n, ABI_MAX_SIZE, abi->init);
  const uint8_t *tail = (const uint8_t *)user;
  for (uint32_t i = abi->size; i < n; i++)
    if (tail[i])
      return fattn__failbuf(detail, detail_len, FATTN_ERR_INVALID,
                            "%s struct_size %u: byte %u is not zero, past the %u bytes this library knows (a "
                            "newer field it cannot honour)",
                            abi->name, n, i, abi->size);
  return FATTN_OK;
}

const void *fattn__abi_read(const fattn__abi *abi, const void *user, void *local) {
  const uint32_t n = user_size(user);
  if (n == abi->size) return user;
  memcpy(local, abi->defaults, abi->size);
  memcpy(local, user, n < abi->size ? n : abi->size);
  memcpy(local, &abi->size, sizeof abi->size); /* reads as this library's own from here on */
  return local;
}

void fattn__abi_write(const fattn__abi *abi, void *user, const void *full) {
  const uint32_t n = user_size(user);
  const size_t head = sizeof(uint32_t);
  memcpy((uint8_t *)user + head, (const uint8_t *)full + head, (n < abi->size ? n : abi->size) - head);
}
