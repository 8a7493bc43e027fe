package org.apache.iceberg;

import java.io.IOException;
import java.util.function.Consumer;
import org.apache.iceberg.io.CloseableIterable;

/**
 * Public access to every entry of a manifest, DELETED ones included.
 *
 * <p>{@code ManifestReader.entries()} and {@code ManifestEntry} are package-private in Iceberg,
 * so this bridge lives in Iceberg's package (the jars are not sealed).
 */
public final class ManifestEntries {
  private ManifestEntries() {}

  /** One manifest entry; {@code file} may be reused by the reader after the callback returns. */
  public record Entry(
      int status,
      Long snapshotId,
      Long dataSequenceNumber,
      Long fileSequenceNumber,
      ContentFile<?> file) {}

  /** Calls {@code consumer} with every entry of {@code reader}, live or deleted. */
  public static <F extends ContentFile<F>> void forEach(
      ManifestReader<F> reader, Consumer<Entry> consumer) throws IOException {
    try (CloseableIterable<ManifestEntry<F>> entries = reader.entries()) {
      for (ManifestEntry<F> entry : entries) {
        consumer.accept(
            new Entry(
                entry.status().id(),
                entry.snapshotId(),
                entry.dataSequenceNumber(),
                entry.fileSequenceNumber(),
                entry.file()));
      }
    }
  }
}
