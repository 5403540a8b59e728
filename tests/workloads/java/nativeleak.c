/* The native half of NativeLeak.java: stash_record() copies an order into a malloc'd buffer; one
 * in seven is "kept for an audit" that never happens: the pointer is dropped, the block leaked. */
#include <jni.h>
#include <stdlib.h>
#include <string.h>

static long checksum;

__attribute__((noinline)) static char *stash_record(long id, int bytes) {
    char *record = malloc((size_t)bytes);
    if (record != NULL) {
        memset(record, (int)(id & 0x7f), (size_t)bytes);
    }
    return record;
}

JNIEXPORT jlong JNICALL Java_NativeLeak_recordOrder(JNIEnv *env, jclass cls, jlong id, jint bytes) {
    (void)env;
    (void)cls;
    char *record = stash_record((long)id, (int)bytes);
    if (record == NULL) {
        return 0;
    }
    checksum += record[bytes / 2];
    if (id % 7 != 0) {
        free(record);
    }
    return checksum;
}
