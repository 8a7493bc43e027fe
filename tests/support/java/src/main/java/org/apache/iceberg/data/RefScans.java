package org.apache.iceberg.data;

import org.apache.iceberg.Table;
import org.apache.iceberg.io.CloseableIterable;

/**
 * Generic reads of a branch or tag, as {@code table.newScan().useRef(name)} plans them.
 *
 * <p>{@code IcebergGenerics.ScanBuilder} has no {@code useRef}; its iterable is package-private.
 */
public final class RefScans {
  private RefScans() {}

  /** Every live row of the ref's head snapshot, deletes applied. */
  public static CloseableIterable<Record> read(Table table, String ref) {
    return new TableScanIterable(table.newScan().useRef(ref), false);
  }
}
