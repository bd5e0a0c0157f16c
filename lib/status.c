/* status.c: status names and messages from the X-macro, the version string and number, region
 * names, and the fixed-size detail buffer every failing call writes. */
#include <stdio.h>

#include "lib/internal.h"

const char *fattn_strerror(fattn_status status) {
  switch (status) {
#define FATTN_STATUS_MSG_(name, value, msg) \
  case FATTN_##name:                        \
    return msg;
    FATTN_STATUS_MAP(FATTN_STATUS_MSG_)
#undef FATTN_STATUS_MSG_
  }
  return "unknown status";
}

const char *fattn_status_name(fattn_status status) {
  switch (status) {
#define FATTN_STATUS_NAME_(name, value, msg) \
  case FATTN_##name:                         \
    return "FATTN_" #name;
    FATTN_STATUS_MAP(FATTN_STATUS_NAME_)
#undef FATTN_STATUS_NAME_
  }
  return "FATTN_UNKNOWN";
}

#define FATTN_STR2_(x) #x
#define FATTN_STR_(x) FATTN_STR2_(x)
const char *fattn_version(void) {
  return FATTN_STR_(FATTN_VERSION_MAJOR) "." FATTN_STR_(FATTN_VERSION_MINOR) "." FATTN_STR_(
      FATTN_VERSION_PATCH);
}

int fattn_version_number(void) { return FATTN_VERSION_NUMBER; }

const char *fattn_region_name(fattn_region region) {
  static const char *const names[FATTN_REGION_COUNT] = {
      "k_pool", "v_pool", "page_table", "metadata", "split_workspace", "graph_static",
      "model", "pinned_staging"};
  return (unsigned)region < FATTN_REGION_COUNT ? names[region] : "unknown";
}

fattn_status fattn__vfail(char *buf, size_t len, fattn_status status, const char *fmt,
                          va_list ap) {
  if (buf && len) vsnprintf(buf, len, fmt, ap);
  return status;
}

fattn_status fattn__failbuf(char *buf, size_t len, fattn_status status, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fattn__vfail(buf, len, status, fmt, ap);
  va_end(ap);
  return status;
}

fattn_status fattn__fail(const fattn_ctx *ctx, fattn_status status, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fattn__vfail(fattn__detail_buf(ctx), sizeof ctx->detail, status, fmt, ap);
  va_end(ap);
  return status;
}
