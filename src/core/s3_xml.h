/*
 * s3_xml.h - what datahelix reads of S3's XML answers (internal, pure):
 * the objects of a ListObjectsV2 page and the code and message of an
 * error.  The answers' schema is fixed and flat; only these elements are
 * read, their text unescaped (the five XML entities and numeric character
 * references), nothing else of XML is interpreted (no DTD, no entity
 * definitions: nothing an answer says can make us read more).
 */
#ifndef DH_CORE_S3_XML_H
#define DH_CORE_S3_XML_H

#include <stddef.h>
#include <stdint.h>

/* Called per <Contents> of a page: its <Key> (unescaped) and <Size>.
 * Non-zero stops the walk and is returned. */
typedef int (*dh_s3_object_fn)(void *arg, const char *key, int64_t size);

/* Walks a ListObjectsV2 page (`xml`, NUL-terminated).  *truncated = 1 and
 * `token` (cap bytes) the <NextContinuationToken> when there is a next
 * page.  0; -1 for a page that is not a ListBucketResult or a <Contents>
 * without a key or a size, or a key/token longer than the buffers;
 * else fn's non-zero return. */
int dh__s3_list_page(const char *xml, dh_s3_object_fn fn, void *arg,
                     int *truncated, char *token, size_t cap);

/* The unescaped text of the first <tag>...</tag> in xml into out (cut to
 * cap-1, control characters made blanks): 1 when found, else 0 and "". */
int dh__xml_text(const char *xml, const char *tag, char *out, size_t cap);

#endif
