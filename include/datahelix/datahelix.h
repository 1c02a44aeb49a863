/*
 * datahelix/datahelix.h - umbrella header: the whole public C API
 * (docs/c-api.md), which is what `make install` installs: errors, the
 * descriptor table and its binary index, the media pipeline and the
 * training rank's client.  Every function here is marked DH_API and is
 * exported by libdatahelix.so; nothing else is.
 */
#ifndef DATAHELIX_DATAHELIX_H
#define DATAHELIX_DATAHELIX_H

#include "datahelix/export.h"
#include "datahelix/error.h"
#include "datahelix/table.h"
#include "datahelix/index.h"
#include "datahelix/media.h"
#include "datahelix/client.h"

#endif
