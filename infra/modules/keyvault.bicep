// Key Vault for the Function App's two secrets (Teams webhook URL, approval signing key).
// The vault is created empty: secret values are set after deployment with `az keyvault secret
// set` (docs/deploy.md), so they never appear in parameters, deployment history or what-if
// output, and a redeployment cannot overwrite a rotated secret.

@description('Azure region.')
param location string

@description('Name of the vault (3-24 characters, globally unique).')
@minLength(3)
@maxLength(24)
param name string

@description('Object id of a user or group allowed to set the secrets (Key Vault Secrets Officer on this vault). Empty: grant it yourself.')
param secretsOfficerPrincipalId string = ''

@description('Tags for every resource.')
param tags object = {}

// Key Vault Secrets Officer
var keyVaultSecretsOfficer = 'b86a8fe4-44ce-4948-aee5-eccb2c155cd7'

resource vault 'Microsoft.KeyVault/vaults@2023-07-01' = {
  //checkov:skip=CKV_AZURE_109:Flex Consumption without VNet integration resolves Key Vault references over the public endpoint (App Service is not a trusted service); RBAC limits reads to the app's identity.
  //checkov:skip=CKV_AZURE_189:Same as CKV_AZURE_109; add VNet integration and a private endpoint to close it (docs/deploy.md).
  name: name
  location: location
  tags: tags
  properties: {
    tenantId: subscription().tenantId
    sku: {
      family: 'A'
      name: 'standard'
    }
    enableRbacAuthorization: true
    enableSoftDelete: true
    softDeleteRetentionInDays: 90
    enablePurgeProtection: true
    publicNetworkAccess: 'Enabled'
    networkAcls: {
      bypass: 'AzureServices'
      defaultAction: 'Allow'
    }
  }
}

// Key Vault Secrets Officer: the operator who sets the secret values after deployment.
resource operatorSetsSecrets 'Microsoft.Authorization/roleAssignments@2022-04-01' = if (!empty(secretsOfficerPrincipalId)) {
  scope: vault
  name: guid(vault.id, secretsOfficerPrincipalId, keyVaultSecretsOfficer)
  properties: {
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', keyVaultSecretsOfficer)
    principalId: secretsOfficerPrincipalId
  }
}

@description('Name of the vault.')
output name string = vault.name

@description('URI of the vault, ending with a slash.')
output vaultUri string = vault.properties.vaultUri
